// Spike (2026-11-28): the CPU of a create that copies a template's workspace against one
// that mounts an overlay over it (idmapped lower layer), as measured for
// docs/performance.md, "An overlay workspace, measured". Not part of the build.
//
//   gcc -O2 -o overlay-create overlay-create.c
//   mkdir -p /tmp/spike/{sb,mnts,tplws/src} && echo x > /tmp/spike/tplws/README.md \
//     && chown -R 1000:1000 /tmp/spike/tplws && head -c 300 /dev/urandom > /tmp/spike/obj.pack \
//     && head -c 100 /dev/urandom > /tmp/spike/obj.idx
//   ./overlay-create MODE [EXTRA_FILES [SANDBOXES]]   (as root)
//
// MODE 0: the copy a cold create makes today for the fan-out bench's repository (12
// directories, 10 files given to the sandbox's uid, 2 hard-linked objects), plus
// EXTRA_FILES worktree files (a directory per ten); MODE 1: a sandbox directory, an
// upper and a work directory, and an overlay of the template mounted (new mount API)
// in a private mount namespace; MODE 2: as 1 with the lower layer idmapped (a user
// namespace mapping the template's owner 1000 to the sandbox's uid), so the sandbox
// owns what it sees and copy-up gives its writes to it; MODE 3: one such mount, then
// bubblewrap started as the sandbox's uid (as the provisioner starts it: its own user
// namespace, everything unshared) with the merged view bound at /workspace, writing
// through it; prints what the sandbox saw and what landed in the upper directory.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <sched.h>
#include <time.h>
#include <errno.h>
#include <sys/stat.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <linux/mount.h>
#include <grp.h>

static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e3+t.tv_nsec/1e6;}
static double cpu(void){struct timespec t;clock_gettime(CLOCK_PROCESS_CPUTIME_ID,&t);return t.tv_sec*1e3+t.tv_nsec/1e6;}
#define CK(x) do{ if((x)<0){perror(#x); exit(1);} }while(0)
static const char *dirs[]={"workspace","workspace/src","workspace/.git","workspace/.git/hooks","workspace/.git/info","workspace/.git/objects","workspace/.git/objects/pack","workspace/.git/objects/info","workspace/.git/refs","workspace/.git/refs/heads","workspace/.git/refs/tags",0};
static const char *files[]={"workspace/README.md","workspace/src/lib.txt","workspace/.git/HEAD","workspace/.git/config","workspace/.git/index","workspace/.git/packed-refs","workspace/.git/info/exclude","workspace/.git/description","workspace/.git/refs/heads/.forkyard-branch","record",0};
static const char *links[]={"workspace/.git/objects/pack/p.pack","workspace/.git/objects/pack/p.idx",0};
static void wfile(const char*p,int uid){int fd=open(p,O_CREAT|O_EXCL|O_WRONLY|O_CLOEXEC,0644);CK(fd);CK(write(fd,"some bytes of a file\n",21));CK(fchown(fd,uid,uid));close(fd);}
static int extra=0;
static void copy(const char*base,int uid){
  char p[512]; CK(mkdir(base,0700)); CK(chown(base,uid,uid));
  for(int i=0;dirs[i];i++){snprintf(p,512,"%s/%s",base,dirs[i]);CK(mkdir(p,0755));CK(lchown(p,uid,uid));}
  for(int i=0;files[i];i++){snprintf(p,512,"%s/%s",base,files[i]);wfile(p,uid);}
  for(int i=0;links[i];i++){snprintf(p,512,"%s/%s",base,links[i]);CK(link(i?"/tmp/spike/obj.idx":"/tmp/spike/obj.pack",p));}
  for(int i=0;i<extra;i++){ if(i%10==0){snprintf(p,512,"%s/workspace/src/d%d",base,i/10);CK(mkdir(p,0755));CK(lchown(p,uid,uid));} snprintf(p,512,"%s/workspace/src/d%d/f%d.rs",base,i/10,i);wfile(p,uid);}
}
static int fsopen_(const char*n,unsigned f){return syscall(SYS_fsopen,n,f);}
static int fsconfig_(int fd,unsigned cmd,const char*k,const void*v,int aux){return syscall(SYS_fsconfig,fd,cmd,k,v,aux);}
static int fsmount_(int fd,unsigned f,unsigned a){return syscall(SYS_fsmount,fd,f,a);}
static int move_mount_(int f,const char*fp,int t,const char*tp,unsigned fl){return syscall(SYS_move_mount,f,fp,t,tp,fl);}
static int open_tree_(int d,const char*p,unsigned f){return syscall(SYS_open_tree,d,p,f);}
static int mount_setattr_(int d,const char*p,unsigned f,struct mount_attr*a,size_t s){return syscall(SYS_mount_setattr,d,p,f,a,s);}
static int userns_fd(int host_uid){ /* a userns mapping 1000 -> host_uid (as a sandbox's would) */
  int pfd[2]; CK(pipe(pfd)); pid_t c=fork(); if(c==0){ close(pfd[1]); unshare(CLONE_NEWUSER); char b; read(pfd[0],&b,1); pause(); _exit(0);} 
  close(pfd[0]); usleep(20000); char p[64],m[64]; snprintf(p,64,"/proc/%d/uid_map",c); snprintf(m,64,"1000 %d 1\n",host_uid);
  int f=open(p,O_WRONLY); CK(f); CK(write(f,m,strlen(m))); close(f); snprintf(p,64,"/proc/%d/gid_map",c);
  f=open(p,O_WRONLY); CK(f); CK(write(f,m,strlen(m))); close(f);
  snprintf(p,64,"/proc/%d/ns/user",c); int u=open(p,O_RDONLY|O_CLOEXEC); CK(u); kill(c,9); waitpid(c,0,0); return u; }
static void overlay(const char*base,int uid,int uns,const char*mnt){
  char p[512],u[512],w[512],l[64]; CK(mkdir(base,0700)); CK(chown(base,uid,uid));
  snprintf(u,512,"%s/upper",base); CK(mkdir(u,0755)); CK(chown(u,uid,uid));
  snprintf(w,512,"%s/work",base); CK(mkdir(w,0700));
  snprintf(p,512,"%s/record",base); wfile(p,0);
  int t=open_tree_(AT_FDCWD,"/tmp/spike/tplws",OPEN_TREE_CLONE|OPEN_TREE_CLOEXEC); CK(t);
  if(uns>=0){struct mount_attr a={.attr_set=MOUNT_ATTR_IDMAP,.userns_fd=uns}; CK(mount_setattr_(t,"",AT_EMPTY_PATH,&a,sizeof a));}
  int fs=fsopen_("overlay",FSOPEN_CLOEXEC); CK(fs); snprintf(l,64,"/proc/self/fd/%d",t);
  CK(fsconfig_(fs,FSCONFIG_SET_STRING,"lowerdir+",l,0)); CK(fsconfig_(fs,FSCONFIG_SET_STRING,"upperdir",u,0));
  CK(fsconfig_(fs,FSCONFIG_SET_STRING,"workdir",w,0)); CK(fsconfig_(fs,FSCONFIG_CMD_CREATE,0,0,0));
  int m=fsmount_(fs,FSMOUNT_CLOEXEC,0); CK(m); CK(move_mount_(m,"",AT_FDCWD,mnt,MOVE_MOUNT_F_EMPTY_PATH));
  close(m); close(fs); close(t);
}
int main(int argc,char**argv){
  int n=argc>3?atoi(argv[3]):100, mode=atoi(argv[1]); extra=argc>2?atoi(argv[2]):0; char b[256],mnt[256];
  CK(unshare(CLONE_NEWNS)); CK(mount(0,"/",0,MS_REC|MS_PRIVATE,0));
  CK(mount("tmpfs","/tmp/spike/mnts","tmpfs",0,0));
  for(int i=0;i<n;i++){snprintf(mnt,256,"/tmp/spike/mnts/%d",i);mkdir(mnt,0755);}
  int uns = mode>=2 ? userns_fd(100500) : -1;
  if(mode==3){
    overlay("/tmp/spike/sb/bw",100500,uns,"/tmp/spike/mnts/0");
    pid_t c=fork(); if(c==0){ if(setgroups(0,0)||setresgid(100500,100500,100500)||setresuid(100500,100500,100500)){perror("drop");_exit(1);}
      execlp("bwrap","bwrap","--unshare-all","--unshare-user","--die-with-parent","--cap-drop","ALL","--ro-bind","/usr","/usr","--symlink","usr/bin","/bin","--symlink","usr/lib","/lib","--symlink","usr/lib64","/lib64",
        "--proc","/proc","--dev","/dev","--bind","/tmp/spike/mnts/0","/workspace","--chdir","/workspace","--",
        "sh","-c","id -u; ls -ln /workspace /workspace/src; echo more >> README.md && chmod 755 src/lib.txt && mkdir -p src/new && echo wrote; cat /proc/self/mountinfo | grep workspace",(char*)0);
      perror("exec"); _exit(1);}
    int st; waitpid(c,&st,0); printf("bwrap exit %d\n",WEXITSTATUS(st)); fflush(stdout);
    if(system("echo '-- upper:'; ls -lnR /tmp/spike/sb/bw/upper; echo '-- template:'; cat /tmp/spike/tplws/README.md; ls -ln /tmp/spike/tplws/src")) {}
    umount2("/tmp/spike/mnts/0",MNT_DETACH); if(system("rm -rf /tmp/spike/sb/bw")){} return 0; }
  for(int round=0;round<3;round++){
    double t0=now(),c0=cpu();
    for(int i=0;i<n;i++){snprintf(b,256,"/tmp/spike/sb/r%d-%d",round,i);snprintf(mnt,256,"/tmp/spike/mnts/%d",i);
      if(mode==0) copy(b,100500+i); else overlay(b,100500+i,uns,mnt);}
    double t1=now(),c1=cpu();
    printf("mode %d round %d: %.3f ms wall, %.3f ms cpu per sandbox\n",mode,round,(t1-t0)/n,(c1-c0)/n);
    if(mode) for(int i=0;i<n;i++){snprintf(mnt,256,"/tmp/spike/mnts/%d",i); CK(umount2(mnt,MNT_DETACH));}
    char cmd[300]; snprintf(cmd,300,"rm -rf /tmp/spike/sb/r%d-*",round); if(system(cmd)) return 1;
  }

  return 0;
}
